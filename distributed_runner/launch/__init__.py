"""Running a config: in this process or on Ray Train workers (the launcher, its options, the
worker's side), joining a cluster, and the process that validates asynchronously.

May import: engine and everything below it.
"""
