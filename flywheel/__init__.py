"""slimserve.flywheel: the served model's data loop (request logs -> drift -> candidates ->
labelling -> merge -> retrain -> canary -> publish), a library over serving, export and
estimator that only commands and tests import."""
