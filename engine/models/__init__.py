"""Model sources: templates, Hugging Face configs, files, sketches and objects; MoE routing."""
