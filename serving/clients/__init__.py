"""What talks to a running server from outside: the gRPC/REST client, the load generator, the in-process image classifier and served-accuracy checks."""
