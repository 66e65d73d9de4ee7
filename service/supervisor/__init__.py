"""Process wiring: one process serving everything, or a supervisor with an engine and several fronts."""
