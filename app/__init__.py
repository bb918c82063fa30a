"""A2ATS Chat desktop app (PySide6 + pyqtgraph). Imports a2ats_engine, never the reverse."""
