"""Training, evaluation and demo jobs for txl_tf (absl apps).

`python -m training.train`, `python -m training.evaluate`,
`python -m training.generate` and `python -m training.demo`; flagfiles for the
paper's configurations are in `training/configs/`.
"""
