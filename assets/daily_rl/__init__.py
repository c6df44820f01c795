"""Daily outcome RL: plain method modules (structure, judging, rewards, feeds, loop, report) and the
Dagster assets that wire them (headlines, daily_update, daily_report)."""
