"""The learning loop: claim rewarded sessions, build samples, update the policy (loss,
micro-batches, optimizer state, many processes), record the ledger; `service.py` runs it."""
