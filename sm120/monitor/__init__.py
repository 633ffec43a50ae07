"""Monitoring a running deployment: metrics, peaks, alerts, the watchdog and the live view.
What log lines mean is sm120.logs; reading and writing serve.log is sm120.engine."""
