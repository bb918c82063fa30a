"""Dialogs: settings, calibration, codebook details, Hugging Face download, task progress."""
