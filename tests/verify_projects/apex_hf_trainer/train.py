"""The script that runs trainer.py's `Trainer` (a reduction of a transformers example such as
run_ner.py: parse the arguments, build the model and the dataset, `trainer.train()`). The model is
a tiny token classifier (embedding, LayerNorm, a two-layer MLP, a classification head) whose
`forward(input_ids, attention_mask, labels)` returns `(loss, logits)`, on synthetic tagged sequences.

    python train.py --fp16
"""

import argparse

import torch
from torch import nn

from trainer import Trainer, TrainingArguments


class TinyTokenClassifier(nn.Module):
    def __init__(self, vocab_size=50, hidden=32, num_labels=5):
        super().__init__()
        self.embeddings = nn.Embedding(vocab_size, hidden)
        self.LayerNorm = nn.LayerNorm(hidden)
        self.encoder = nn.Sequential(nn.Linear(hidden, 64), nn.GELU(), nn.Linear(64, hidden))
        self.classifier = nn.Linear(hidden, num_labels)
        self.num_labels = num_labels

    def forward(self, input_ids, attention_mask=None, labels=None):
        hidden = self.LayerNorm(self.embeddings(input_ids))
        hidden = hidden + self.encoder(hidden)
        logits = self.classifier(hidden)
        outputs = (logits,)
        if labels is not None:
            active = attention_mask.view(-1) == 1
            loss = nn.CrossEntropyLoss()(logits.view(-1, self.num_labels)[active], labels.view(-1)[active])
            outputs = (loss,) + outputs
        return outputs


class TaggedSequences(torch.utils.data.Dataset):
    def __init__(self, size=256, length=16, vocab_size=50, num_labels=5):
        gen = torch.Generator().manual_seed(3)
        self.input_ids = torch.randint(1, vocab_size, (size, length), generator=gen)
        lengths = torch.randint(length // 2, length + 1, (size,), generator=gen)
        self.attention_mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
        self.input_ids = self.input_ids * self.attention_mask
        self.labels = self.input_ids % num_labels

    def __len__(self):
        return len(self.input_ids)

    def __getitem__(self, i):
        return {"input_ids": self.input_ids[i], "attention_mask": self.attention_mask[i], "labels": self.labels[i]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--fp16_opt_level", default="O1")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    cli = parser.parse_args()
    args = TrainingArguments(fp16=cli.fp16, fp16_opt_level=cli.fp16_opt_level,
                             gradient_accumulation_steps=cli.gradient_accumulation_steps)
    torch.manual_seed(args.seed)
    model = TinyTokenClassifier()
    trainer = Trainer(model=model, args=args, train_dataset=TaggedSequences())
    trainer.train()


if __name__ == "__main__":
    main()
