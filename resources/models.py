"""The model resource: which base model, framework and device the assets load (`ModelLoader`)."""

from outcome_flywheel.models.loader import ModelLoader
from resources.settings import DataclassResource, env_int_or_default, env_or_default, mirrored


class ModelBackendResource(DataclassResource[ModelLoader]):
    """Which base model, which framework, which device; hands the assets a `ModelLoader`."""

    plain = ModelLoader
    variables = {
        "backend": "FLYWHEEL_BACKEND",
        "sampler": "FLYWHEEL_SAMPLER",
        "device": "FLYWHEEL_DEVICE",
        "dtype": "FLYWHEEL_DTYPE",
        "seed": "FLYWHEEL_SEED",
    }
    base_model: str = mirrored(ModelLoader, "base_model")
    backend: str = mirrored(ModelLoader, "backend")
    device: str = mirrored(ModelLoader, "device")
    sampler: str = mirrored(ModelLoader, "sampler")
    dtype: str = mirrored(ModelLoader, "dtype")
    seed: int = mirrored(ModelLoader, "seed")
    data_dir: str = mirrored(ModelLoader, "data_dir")

    @classmethod
    def from_env(cls) -> "ModelBackendResource":
        return cls(
            base_model=env_or_default("FLYWHEEL_BASE_MODEL"),
            backend=env_or_default("FLYWHEEL_BACKEND"),
            sampler=env_or_default("FLYWHEEL_SAMPLER"),
            device=env_or_default("FLYWHEEL_DEVICE"),
            dtype=env_or_default("FLYWHEEL_DTYPE"),
            seed=env_int_or_default("FLYWHEEL_SEED"),
            data_dir=env_or_default("FLYWHEEL_DATA_DIR"),
        )
