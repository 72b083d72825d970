"""Recording completions durably: the record, its writer and transactions, and retry lineage."""
