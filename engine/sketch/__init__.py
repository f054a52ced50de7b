"""The builder's sketch: layer catalogue and types, the document, code export, the analytic estimate."""
