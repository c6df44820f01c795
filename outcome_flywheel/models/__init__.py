"""Model backends behind one small interface, in layers that import only downwards:

- `interface`: `ModelBackend`, `Framework`, sampling and LoRA settings (imports nothing above it);
- `torch/`, `mlx/`: the two backends, mirror files (backend, sampling, log-probs, losses, training);
- `train/`: the trainers as functions of a backend (`train_gspo(backend, examples, config)`, DPO, SFT),
  their configs, micro-batches and the optimiser's saved moments;
- `provision/`: the models the project builds or ships (tiny-local, SmolLM2, Qwen3 shapes);
- `serve/`: the OpenAI-compatible server and the export of checkpoints;
- `loader`: `ModelLoader`, which chooses and loads a backend (`resources.models.ModelBackendResource`
  configures it).
"""
