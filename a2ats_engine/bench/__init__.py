"""Measurements behind `a2ats eval` and `a2ats bench`: quality, ablations, speed, passkey, seed benchmark."""
