"""A CPU-sized reduction, written for ampmigrate's tests, of the `Trainer` of huggingface/transformers
as it was in 2020 (src/transformers/trainer.py, v2.9-v3.0): apex imported at the top in
`try: from apex import amp ... except ImportError:` behind `is_apex_available()`, `amp.initialize`
inside `Trainer.train()` under `if self.args.fp16:` with `opt_level=self.args.fp16_opt_level`, a
gradient-accumulation loop that adds `self._training_step(model, inputs, optimizer)` to `tr_loss`
and, every `gradient_accumulation_steps` micro-batches, clips `amp.master_params(optimizer)` (fp16)
or `model.parameters()`, then `optimizer.step()`, `scheduler.step()`, `model.zero_grad()`;
`_training_step` runs the forward and backpropagates through `amp.scale_loss` (fp16) or plainly.
The model is a tiny token classifier on synthetic sequences (see train.py).
"""

import logging
import math
from dataclasses import dataclass

import torch
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, RandomSampler

try:
    from apex import amp

    _has_apex = True
except ImportError:
    _has_apex = False


def is_apex_available():
    return _has_apex


logger = logging.getLogger(__name__)


@dataclass
class TrainingArguments:
    output_dir: str = "outdir"
    per_gpu_train_batch_size: int = 8
    gradient_accumulation_steps: int = 2
    learning_rate: float = 1e-3
    weight_decay: float = 0.01
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0
    num_train_epochs: float = 20.0
    warmup_steps: int = 5
    logging_steps: int = 10
    seed: int = 42
    fp16: bool = False
    fp16_opt_level: str = "O1"
    n_gpu: int = 1

    @property
    def train_batch_size(self):
        return self.per_gpu_train_batch_size * max(1, self.n_gpu)

    @property
    def device(self):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def get_linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps, last_epoch=-1):
    def lr_lambda(current_step):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        return max(0.0, float(num_training_steps - current_step) / float(max(1, num_training_steps - num_warmup_steps)))

    return LambdaLR(optimizer, lr_lambda, last_epoch)


class Trainer:
    def __init__(self, model, args, train_dataset=None):
        self.model = model.to(args.device)
        self.args = args
        self.train_dataset = train_dataset
        self.global_step = None
        self.epoch = None

    def get_train_dataloader(self):
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        sampler = RandomSampler(self.train_dataset)
        return DataLoader(self.train_dataset, batch_size=self.args.train_batch_size, sampler=sampler)

    def get_optimizers(self, num_training_steps):
        no_decay = ["bias", "LayerNorm.weight"]
        optimizer_grouped_parameters = [
            {
                "params": [p for n, p in self.model.named_parameters() if not any(nd in n for nd in no_decay)],
                "weight_decay": self.args.weight_decay,
            },
            {
                "params": [p for n, p in self.model.named_parameters() if any(nd in n for nd in no_decay)],
                "weight_decay": 0.0,
            },
        ]
        optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=self.args.learning_rate, eps=self.args.adam_epsilon)
        scheduler = get_linear_schedule_with_warmup(
            optimizer, num_warmup_steps=self.args.warmup_steps, num_training_steps=num_training_steps
        )
        return optimizer, scheduler

    def train(self):
        train_dataloader = self.get_train_dataloader()
        num_update_steps_per_epoch = len(train_dataloader) // self.args.gradient_accumulation_steps
        t_total = int(num_update_steps_per_epoch * self.args.num_train_epochs)
        num_train_epochs = self.args.num_train_epochs

        optimizer, scheduler = self.get_optimizers(num_training_steps=t_total)

        model = self.model
        if self.args.fp16:
            if not is_apex_available():
                raise ImportError("Please install apex from https://www.github.com/nvidia/apex to use fp16 training.")
            model, optimizer = amp.initialize(model, optimizer, opt_level=self.args.fp16_opt_level)

        if self.args.n_gpu > 1:
            model = torch.nn.DataParallel(model)

        logger.info("***** Running training *****")
        logger.info("  Num examples = %d", len(self.train_dataset))
        logger.info("  Gradient Accumulation steps = %d", self.args.gradient_accumulation_steps)
        logger.info("  Total optimization steps = %d", t_total)

        self.global_step = 0
        self.epoch = 0
        tr_loss = 0.0
        logging_loss = 0.0
        model.zero_grad()
        for epoch in range(int(math.ceil(num_train_epochs))):
            for step, inputs in enumerate(train_dataloader):
                tr_loss += self._training_step(model, inputs, optimizer)

                if (step + 1) % self.args.gradient_accumulation_steps == 0 or (
                    # last step in epoch but step is always smaller than gradient_accumulation_steps
                    len(train_dataloader) <= self.args.gradient_accumulation_steps
                    and (step + 1) == len(train_dataloader)
                ):
                    if self.args.fp16:
                        torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), self.args.max_grad_norm)
                    else:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), self.args.max_grad_norm)

                    optimizer.step()
                    scheduler.step()
                    model.zero_grad()
                    self.global_step += 1
                    self.epoch = epoch + (step + 1) / len(train_dataloader)

                    if self.global_step % self.args.logging_steps == 0:
                        logs = {
                            "loss": (tr_loss - logging_loss) / self.args.logging_steps,
                            "learning_rate": scheduler.get_last_lr()[0],
                            "epoch": self.epoch,
                        }
                        logging_loss = tr_loss
                        print(logs)

                if 0 < t_total < self.global_step:
                    break
        return self.global_step, tr_loss / max(1, self.global_step)

    def _training_step(self, model, inputs, optimizer):
        model.train()
        for k, v in inputs.items():
            inputs[k] = v.to(self.args.device)

        outputs = model(**inputs)
        loss = outputs[0]  # model outputs are always tuple in transformers (see doc)

        if self.args.n_gpu > 1:
            loss = loss.mean()  # mean() to average on multi-gpu parallel training
        if self.args.gradient_accumulation_steps > 1:
            loss = loss / self.args.gradient_accumulation_steps

        if self.args.fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()

        return loss.item()
