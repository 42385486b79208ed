"""Which model files a command runs: the pair registry (`models.toml`), the Hugging Face Hub
(`hub`, the only importer of huggingface_hub), the embedded model, and resolving -m/--target/--draft."""
