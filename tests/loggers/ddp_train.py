"""Run by ``torchrun --nproc_per_node 2`` in test_ddp.py: a tiny Trainer with MLflowLogger.

Usage: ddp_train.py <output_dir> <sqlite_uri>
"""

import sys

import torch.distributed as dist

from hf_callbacks_plus.loggers.mlflow import MLflowLogger
from tests.tiny_models import exit_distributed_script, make_trainer

output_dir, uri = sys.argv[1], sys.argv[2]
logger = MLflowLogger(tracking_uri=uri, experiment_name="ddp")
trainer = make_trainer(output_dir, callbacks=[logger], logging_steps=1, max_steps=4, ddp_backend="gloo")
trainer.train()
dist.destroy_process_group()  # else gloo threads can SIGABRT a rank at exit (pytorch#190489)
exit_distributed_script()  # they still do now and then, in the interpreter's teardown
