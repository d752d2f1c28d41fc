# Reduced from maskrcnn_benchmark/engine/trainer.py (see train_net.py's docstring).
import datetime
import logging
import time

import torch

from apex import amp


def adjust_lr(optimizer, factor):
    for param_group in optimizer.param_groups:
        param_group["lr"] *= factor


def do_train(
    model,
    data_loader,
    optimizer,
    scheduler,
    device,
    arguments,
):
    logger = logging.getLogger("maskrcnn_benchmark.trainer")
    logger.info("Start training")
    max_iter = len(data_loader)
    start_iter = arguments["iteration"]
    model.train()
    start_training_time = time.time()
    for iteration, (images, targets) in enumerate(data_loader, start_iter):
        iteration = iteration + 1
        arguments["iteration"] = iteration

        images = images.to(device)
        targets = [target.to(device) for target in targets]

        loss_dict = model(images, targets)

        losses = sum(loss for loss in loss_dict.values())

        optimizer.zero_grad()
        # Note: If mixed precision is not used, this ends up doing nothing
        # Otherwise apply loss scaling for mixed-precision recipe
        with amp.scale_loss(losses, optimizer) as scaled_losses:
            scaled_losses.backward()
        optimizer.step()
        scheduler.step()

        if iteration % 20 == 0 or iteration == max_iter:
            logger.info("iter: %d loss: %.4f lr: %.6f", iteration, losses.item(), optimizer.param_groups[0]["lr"])
    total_training_time = time.time() - start_training_time
    logger.info("Total training time: %s", datetime.timedelta(seconds=int(total_training_time)))
