"""Several processes (or Macs) serving one model: MLX's distributed runtime, pipeline split.

`pipeline.py` splits the decoder layers over the ranks (rank 0 the last ones, as in mlx-lm);
`plan.py` joins the ranks' layer plans; `codebook.py` holds a rank's codebook rows; `load.py`
loads a rank's layers; `chat.py` is `python -m a2ats_engine.distributed` (started by
`mlx.launch`, or by `a2ats chat --hosts FILE` through `launch.py`). See README 'Several machines'.
"""
