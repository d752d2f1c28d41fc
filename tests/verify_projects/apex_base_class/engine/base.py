import logging

import torch

try:
    from apex import amp
except ImportError:
    amp = None


class BaseRunner:
    """Builds the optimizer and sets mixed precision up; subclasses train."""

    def __init__(self, args, network):
        self.args = args
        self.network = network.to(args.device)
        self.init_optimizer()
        if self.args.fp16:
            self.network, self.optimizer = amp.initialize(self.network, self.optimizer, opt_level=self.args.fp16_opt_level)
        self.logger = logging.getLogger("runner")

    def init_optimizer(self):
        self.optimizer = torch.optim.SGD(self.network.parameters(), lr=self.args.lr, momentum=0.9)

    def train(self, batches):
        for epoch in range(self.args.epochs):
            self.logger.info("epoch %d loss %.4f", epoch, self.train_epoch(batches))
