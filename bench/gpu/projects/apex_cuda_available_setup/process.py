# The epoch of train.py's project (see its docstring).
import torch
from apex import amp


def train(model, train_loader, epoch, criterion, optimizer, is_amp):
    model.train()
    for i, (img, gloc, glabel) in enumerate(train_loader):
        if torch.cuda.is_available():
            img, gloc, glabel = img.cuda(), gloc.cuda(), glabel.cuda()
        ploc, plabel = model(img)
        ploc, plabel = ploc.float(), plabel.float()
        loss = criterion(ploc, plabel, gloc, glabel)
        if is_amp:
            with amp.scale_loss(loss, optimizer) as scale_loss:
                scale_loss.backward()
        else:
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
