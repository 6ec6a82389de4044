"""Small models written the way ordinary PyTorch code is written, for the two-device tests.

Each module holds a model and ``train(model, device, steps, ...) -> (losses, model)``
(plus, where the model has one, an evaluation or sampling function). None of them
calls the SDK: they move the model and the data with ``.to(device)`` or build them
inside ``with torch.device(device)``, like code written for ``"cuda"``, so the
device is the only difference between a run on ``"cpu"`` and one on
``sess.device`` (tests/e2e/test_real_models.py).
"""
