"""servesim: a discrete-event simulator of LLM serving."""

__version__ = "0.1.0"
