"""`bertserve bench`: load generator, same-run baselines and the report (imports torch only in subprocesses)."""
