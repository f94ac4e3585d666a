"""searchrl.demo: the CPU miniatures. A synthetic world no model can know (`synthetic`), scripted cold starts
(`scripted`) and one entry point per paper (`autosearch`; `python -m searchrl.demo` runs it)."""
