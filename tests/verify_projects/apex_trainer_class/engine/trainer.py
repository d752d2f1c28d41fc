import logging

import torch

try:
    from apex import amp
except ImportError:
    amp = None


class Trainer:
    def __init__(self, model, optimizer, device, epochs=1, fp16=False, grad_clip=0.0):
        self.model = model
        self.optimizer = optimizer
        self.device = device
        self.epochs = epochs
        self.fp16 = fp16
        self.grad_clip = grad_clip
        self.criterion = torch.nn.BCEWithLogitsLoss()
        self.logger = logging.getLogger("trainer")

    def train_epoch(self, batches):
        self.model.train()
        total = 0.0
        for tokens, labels in batches:
            tokens, labels = tokens.to(self.device), labels.to(self.device)
            logits = self.model(tokens)
            loss = self.criterion(logits, labels)
            self.optimizer.zero_grad()
            if self.fp16:
                with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                    scaled_loss.backward()
                torch.nn.utils.clip_grad_norm_(amp.master_params(self.optimizer), self.grad_clip)
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
            self.optimizer.step()
            total += loss.item()
        return total / len(batches)

    def train(self, batches):
        for epoch in range(self.epochs):
            self.logger.info("epoch %d loss %.4f", epoch, self.train_epoch(batches))
