"""The preference flywheel: operator decisions -> T+5 outcomes -> outcome-weighted DPO pairs ->
LoRA adapter -> holdout AUC, rejected winners, drift and a style-match score.

Plain modules (no Dagster): `audit_log`, `windows`, `weighting`, `scoring`, `evaluation_methods`
(imported by `evaluation`), `status`. Asset modules: `decisions`, `outcomes`, `dataset`,
`adapter`, `evaluation`.
"""
