"""The statuses of a policy version (`policy_versions.status`): which versions may serve whom."""

CANDIDATE = "candidate"  # recorded, under its gate: only sessions pinned to it reach it
PROMOTED = "promoted"  # passed its gate (or the model has none): may serve all traffic
REJECTED = "rejected"  # failed its gate (scores in gate_report): never serves unpinned traffic
ROLLED_BACK = "rolled_back"  # an operator rolled the model back past it
STATUSES = (CANDIDATE, PROMOTED, REJECTED, ROLLED_BACK)
