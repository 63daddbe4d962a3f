"""Course applications built on needle: MNIST/CIFAR-10/PTB training loops, models, the demo."""
