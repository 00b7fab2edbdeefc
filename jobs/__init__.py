"""Job runners: code that runs inside Ray, one module per job kind."""
