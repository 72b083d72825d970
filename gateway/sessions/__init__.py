"""Sessions, groups and rewards: the REST API that turns traffic into rewarded episodes."""
