"""batchclient inside other tools. Each integration imports its tool only when it is imported.

- :mod:`batchclient.integrations.lm_eval`: an lm-evaluation-harness model (``--model
  batchclient``) over any provider, and the command that runs lm-eval with it (guide:
  ``docs/evals.md``).
"""
