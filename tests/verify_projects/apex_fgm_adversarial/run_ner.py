"""A CPU-sized reduction, written for ampmigrate's tests, of the training loop of an NER script with
FGM adversarial training in the style of lonePatient/BERT-NER-Pytorch (run_ner_softmax.py,
run_ner_crf.py): apex imported inside `train()` under `if args.fp16:` and
`amp.initialize(model, optimizer, opt_level=args.fp16_opt_level)`; per batch, the loss backpropagated
through `amp.scale_loss` (fp16) or plainly, then, with `--do_adv`, `fgm.attack()` (the embedding
weights moved by epsilon * grad / ||grad||, reading the gradients that backward left), the
adversarial loss `loss_adv.backward()` on the perturbed embeddings, `fgm.restore()`; every
`gradient_accumulation_steps` batches a clip of `amp.master_params(optimizer)` (fp16) or
`model.parameters()`, `optimizer.step()`, `scheduler.step()`, `model.zero_grad()`.
The model is a tiny token classifier (word embeddings, a GRU, a softmax tagger) on synthetic
tagged sentences.

    python run_ner.py --fp16 --do_adv
"""

import argparse

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, RandomSampler, TensorDataset


class FGM:
    """Fast Gradient Method on the embedding weights (Miyato et al.)."""

    def __init__(self, model, emb_name, epsilon=1.0):
        self.model = model
        self.epsilon = epsilon
        self.emb_name = emb_name
        self.backup = {}

    def attack(self):
        for name, param in self.model.named_parameters():
            if param.requires_grad and self.emb_name in name:
                self.backup[name] = param.data.clone()
                norm = torch.norm(param.grad)
                if norm != 0 and not torch.isnan(norm):
                    r_at = self.epsilon * param.grad / norm
                    param.data.add_(r_at)

    def restore(self):
        for name, param in self.model.named_parameters():
            if param.requires_grad and self.emb_name in name:
                assert name in self.backup
                param.data = self.backup[name]
        self.backup = {}


class TinyNerSoftmax(nn.Module):
    def __init__(self, vocab_size=60, hidden=32, num_labels=7):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)
        self.dropout = nn.Dropout(0.1)
        self.classifier = nn.Linear(hidden, num_labels)
        self.num_labels = num_labels
        self.init_weights()

    def init_weights(self, initializer_range=0.02):
        # as BERT's `_init_weights`: small embeddings, so that an epsilon-sized step on them matters
        self.word_embeddings.weight.data.normal_(mean=0.0, std=initializer_range)
        self.classifier.weight.data.normal_(mean=0.0, std=initializer_range)
        self.classifier.bias.data.zero_()

    def forward(self, input_ids, attention_mask=None, labels=None):
        sequence_output, _ = self.rnn(self.word_embeddings(input_ids))
        logits = self.classifier(self.dropout(sequence_output))
        outputs = (logits,)
        if labels is not None:
            loss_fct = nn.CrossEntropyLoss(ignore_index=0)
            active_loss = attention_mask.view(-1) == 1
            active_logits = logits.view(-1, self.num_labels)[active_loss]
            active_labels = labels.view(-1)[active_loss]
            loss = loss_fct(active_logits, active_labels)
            outputs = (loss,) + outputs
        return outputs


def load_examples(size=320, length=12, vocab_size=60, num_labels=7):
    gen = torch.Generator().manual_seed(11)
    input_ids = torch.randint(1, vocab_size, (size, length), generator=gen)
    lengths = torch.randint(length // 2, length + 1, (size,), generator=gen)
    attention_mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    input_ids = input_ids * attention_mask
    # a tag depends on the word and on its left neighbour (the GRU has something to learn)
    left = torch.cat([torch.zeros(size, 1, dtype=torch.long), input_ids[:, :-1]], dim=1)
    labels = (1 + (input_ids + 2 * left) % (num_labels - 1)) * attention_mask
    return TensorDataset(input_ids, attention_mask, labels)


def get_linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps):
    def lr_lambda(current_step):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        return max(0.0, float(num_training_steps - current_step) / float(max(1, num_training_steps - num_warmup_steps)))

    return LambdaLR(optimizer, lr_lambda)


def train(args, train_dataset, model):
    train_dataloader = DataLoader(train_dataset, sampler=RandomSampler(train_dataset), batch_size=args.train_batch_size)
    t_total = len(train_dataloader) // args.gradient_accumulation_steps * args.num_train_epochs
    no_decay = ["bias", "LayerNorm.weight"]
    optimizer_grouped_parameters = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": args.weight_decay},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=args.learning_rate, eps=args.adam_epsilon)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=args.warmup_steps, num_training_steps=t_total)
    if args.fp16:
        try:
            from apex import amp
        except ImportError:
            raise ImportError("Please install apex from https://www.github.com/nvidia/apex to use fp16 training.")
        model, optimizer = amp.initialize(model, optimizer, opt_level=args.fp16_opt_level)

    global_step = 0
    tr_loss = 0.0
    model.zero_grad()
    if args.do_adv:
        fgm = FGM(model, emb_name=args.adv_name, epsilon=args.adv_epsilon)
    for epoch in range(int(args.num_train_epochs)):
        for step, batch in enumerate(train_dataloader):
            model.train()
            batch = tuple(t.to(args.device) for t in batch)
            inputs = {"input_ids": batch[0], "attention_mask": batch[1], "labels": batch[2]}
            outputs = model(**inputs)
            loss = outputs[0]  # model outputs are always tuple in pytorch-transformers (see doc)
            if args.gradient_accumulation_steps > 1:
                loss = loss / args.gradient_accumulation_steps
            if args.fp16:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            if args.do_adv:
                fgm.attack()
                loss_adv = model(**inputs)[0]
                loss_adv.backward()
                fgm.restore()
            tr_loss += loss.item()
            if (step + 1) % args.gradient_accumulation_steps == 0:
                if args.fp16:
                    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), args.max_grad_norm)
                else:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                scheduler.step()  # Update learning rate schedule
                model.zero_grad()
                global_step += 1
                if global_step % args.logging_steps == 0:
                    print("step {} loss {:.4f}".format(global_step, tr_loss / global_step))
    return global_step, tr_loss / max(1, global_step)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--fp16_opt_level", type=str, default="O1")
    parser.add_argument("--do_adv", action="store_true")
    parser.add_argument("--adv_epsilon", default=1.0, type=float)
    parser.add_argument("--adv_name", default="word_embeddings", type=str)
    parser.add_argument("--train_batch_size", default=16, type=int)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--learning_rate", default=3e-3, type=float)
    parser.add_argument("--weight_decay", default=0.01, type=float)
    parser.add_argument("--adam_epsilon", default=1e-8, type=float)
    parser.add_argument("--max_grad_norm", default=1.0, type=float)
    parser.add_argument("--num_train_epochs", default=20, type=int)
    parser.add_argument("--warmup_steps", default=5, type=int)
    parser.add_argument("--logging_steps", default=10, type=int)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    args.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    model = TinyNerSoftmax().to(args.device)
    train(args, load_examples(), model)


if __name__ == "__main__":
    main()
