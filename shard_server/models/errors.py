"""The error a config.json textgen cannot serve raises, with the reason in its message."""


class UnsupportedModelError(ValueError):
    pass
