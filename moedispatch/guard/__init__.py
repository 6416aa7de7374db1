"""The engine guard (issue 24): moedispatch's check of a vLLM / SGLang launch at the engine's start-up.

``moedispatch exec [--guard warn|refuse|fix] -- <launch>`` (:mod:`moedispatch.guard.launch`) is the process-0 check
without installing anything into the engine's environment: lint the launch, print what it finds, then replace this
process with the launch (``execvpe``: same PID, argv and environment) — or, with ``refuse``, exit 3 instead of
launching a known-wrong configuration; with ``fix``, launch the corrected command and environment and say so.

Nothing here runs at import.
"""

__all__: list[str] = []
