"""The REST API: one router per area (`decisions` and `preferences` of the flywheel, `feedback` on the
daily notes, `rl` for both loops' status and history)."""
