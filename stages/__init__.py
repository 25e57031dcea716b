"""One thin module per DVC stage: `python -m stages.<name>` (see dvc.yaml).

Under `python -m pipeline repro` a stage runs in a fork of a server that has imported torch, transformers and
Prefect already (pipeline/core/forkserver.py); `delegate` returns at once when there is none.
"""

from pipeline.core.forkserver import delegate

delegate()
