"""waitress serving a WSGI app that reads the body and answers a fixed JSON reply: the
HTTP server library's own request rate, which the REST API's rate is compared with.
Same waitress settings as serving/api/rest_api.py (threads, poll loop).

    python benchmarks/noop_wsgi.py THREADS REPLY_BYTES   (prints its port, serves until killed)
"""
import logging
import sys

import waitress.server


def main():
    logging.getLogger("waitress").setLevel(logging.ERROR)  # no "task queue depth" chatter
    threads, reply_bytes = int(sys.argv[1]), int(sys.argv[2])
    reply = b'{"predictions": [' + b" " * max(0, reply_bytes - 19) + b"]}"

    def app(environ, start_response):
        length = int(environ.get("CONTENT_LENGTH") or 0)
        if length:
            environ["wsgi.input"].read(length)
        start_response("200 OK", [("Content-Type", "application/json"),
                                  ("Content-Length", str(len(reply)))])
        return [reply]

    server = waitress.server.create_server(app, host="127.0.0.1", port=0, threads=threads,
                                           asyncore_use_poll=True)
    print(server.effective_port, flush=True)
    server.run()


if __name__ == "__main__":
    main()
