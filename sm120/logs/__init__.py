"""What engine logs mean: the failure catalogue, start-up phases, the log parser and the
typed events it makes, the fatal-line catalogue, and naming failures in whole logs. Pure:
text in, findings out."""
