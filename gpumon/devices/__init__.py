"""What a GPU looks like to gpumon.

`model` holds the frozen values every other layer passes around; `health` judges them (pure);
`backend` is the one narrow interface a source of GPUs implements; `nvml` and `simulated` are
the two sources.
"""
