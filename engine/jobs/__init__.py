"""The app's engine calls (one picklable function per job) and the worker process that runs them."""
