import torch

from engine.base import BaseRunner

try:
    from apex import amp
except ImportError:
    amp = None


class ClassifierRunner(BaseRunner):
    def __init__(self, args, network):
        super().__init__(args, network)
        self.criterion = torch.nn.BCEWithLogitsLoss()

    def train_epoch(self, batches):
        self.network.train()
        total = 0.0
        for tokens, labels in batches:
            tokens, labels = tokens.to(self.args.device), labels.to(self.args.device)
            logits = self.network(tokens)
            loss = self.criterion(logits, labels)
            self.optimizer.zero_grad()
            if self.args.fp16:
                with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                    scaled_loss.backward()
                torch.nn.utils.clip_grad_norm_(amp.master_params(self.optimizer), self.args.grad_clip)
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.network.parameters(), self.args.grad_clip)
            self.optimizer.step()
            total += loss.item()
        return total / len(batches)
