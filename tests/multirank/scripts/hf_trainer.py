"""A Hugging Face ``Trainer`` script with no hvdlite line in it: a tiny GPT-2 built from its config
(nothing downloaded). Usage: hf_trainer.py SETUP OUT [STOP_RANK]

SETUP: ``plain`` (``TrainingArguments()`` as on a GPU machine; under ``hvdliterun --torch-backend
hvdlite``), ``cpu`` (``use_cpu=True``: the reference under torchrun, on gloo), ``single`` (one
process, the whole batch). On the main process the parameters go to OUT. STOP_RANK: that rank stops
itself (SIGSTOP) after the first step, as a hung rank would.
"""

import os
import signal
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

GLOBAL_BATCH, STEPS, LENGTH = 8, 3, 8


class StopAfterFirstStep(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        print(f"step {state.global_step} done", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)


def samples():
    generator = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, 64, (GLOBAL_BATCH * STEPS, LENGTH), generator=generator)
    return [{"input_ids": row, "labels": row} for row in tokens]


def main(setup, out, stop_rank=None):
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    config = GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=64, n_positions=LENGTH,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(output_dir=out + ".run", per_device_train_batch_size=GLOBAL_BATCH // world,
                             max_steps=STEPS, learning_rate=1e-2, seed=0, report_to=[], save_strategy="no",
                             logging_strategy="no", disable_tqdm=True, use_cpu=setup in ("cpu", "single"))
    stopping = stop_rank is not None and args.process_index == int(stop_rank)
    trainer = Trainer(model=model, args=args, train_dataset=samples(),
                      callbacks=[StopAfterFirstStep()] if stopping else [])
    trainer.train()
    if args.process_index == 0:
        torch.save({k: v.detach().clone() for k, v in trainer.model.state_dict().items()}, out)
    print(f"trainer ok {args.parallel_mode.name} {trainer.accelerator.state.backend} "
          f"rank {args.process_index} of {args.world_size}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
