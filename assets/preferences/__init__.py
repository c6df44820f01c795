"""The preference flywheel: operator decisions -> T+5 outcomes -> outcome-weighted DPO pairs ->
LoRA adapter -> holdout AUC, rejected winners, drift and a style-match score.

Plain modules (no Dagster import): `audit_log` (JSONL schema, quarantine), `windows` (T+5 on
XNYS), `weighting` (pairs, the weighting table, holdout, plan text, exports), `metrics` (AUC,
interval, label, rejected winners, drift, comments), `scoring` (style scores over a
`ModelBackend`), `status` (training status from the warehouse).
Dagster asset modules: `decisions`, `outcomes`, `dataset`, `adapter`, `evaluation`.
"""
