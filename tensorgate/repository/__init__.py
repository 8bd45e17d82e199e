"""The model repository on disk: scanning, layouts, version policy."""
