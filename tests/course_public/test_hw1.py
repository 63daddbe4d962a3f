"""The course's hw1 public tests (tests/test_autograd_hw.py), with needle as the course's needle.

Same calls, dtypes and tolerances: ``assert_allclose`` at its default rtol 1e-7 on forward
passes from Python lists, ``gradient_check`` (the course's checker, in course_data.py) at tol
1e-6 on float64 NumPy data, and MNIST's test split where the course reads it. Expected forward
values are the float64 results of the same inputs, as the course's literals are.
"""
import numdifftools as nd
import numpy as np
from course_data import T10K_IMAGES, T10K_LABELS, gradient_check, needs_mnist

import needle as ndl
from apps.simple_ml import loss_err, nn_epoch, parse_mnist, softmax_loss


# ------------------------------------------------------------------ forward
def test_power_scalar_forward():
    np.testing.assert_allclose(ndl.power_scalar(ndl.Tensor([[0.5, 2.0, 3.0]]), scalar=2).numpy(),
                               np.array([[0.25, 4.0, 9.0]]))


def test_divide_forward():
    np.testing.assert_allclose(
        ndl.divide(ndl.Tensor([[3.3, 4.35, 1.2], [2.45, 0.95, 2.55]]),
                   ndl.Tensor([[4.6, 4.35, 4.8], [0.65, 0.7, 4.4]])).numpy(),
        np.array([[0.71739130434782614, 1.0, 0.25],
                  [3.7692307692307696, 1.3571428571428572, 0.57954545454545447]]))


def test_divide_scalar_forward():
    np.testing.assert_allclose(ndl.divide_scalar(ndl.Tensor([[1.7, 1.45]]), scalar=12).numpy(),
                               np.array([[0.14166666666666666, 0.12083333333333332]]))


def test_matmul_forward():
    np.testing.assert_allclose(
        ndl.matmul(ndl.Tensor([[4.95, 1.75, 0.25], [4.15, 4.25, 0.3], [0.3, 0.4, 2.1]]),
                   ndl.Tensor([[1.35, 2.2, 1.55], [3.85, 4.8, 2.6], [1.15, 0.85, 4.15]])
                   ).numpy(),
        np.array([[13.7075, 19.5025, 13.26], [22.31, 29.785, 18.7275], [4.36, 4.365, 10.22]]))
    np.testing.assert_allclose(
        ndl.matmul(ndl.Tensor([[3.8, 0.05], [2.3, 3.35], [1.6, 2.6]]),
                   ndl.Tensor([[1.1, 3.5, 3.7], [0.05, 1.25, 1.0]])).numpy(),
        np.array([[4.1825, 13.3625, 14.11], [2.6975, 12.2375, 11.86], [1.89, 8.85, 8.52]]))
    np.testing.assert_allclose(
        ndl.matmul(ndl.Tensor([[[4.0, 2.15], [1.25, 1.35], [0.75, 1.6]],
                               [[2.9, 2.15], [3.3, 4.1], [2.5, 0.25]]]),
                   ndl.Tensor([[[1.45, 3.5], [2.65, 1.75]],
                               [[2.9, 1.4], [4.6, 0.45]]])).numpy(),
        np.array([[[4.0, 2.15], [1.25, 1.35], [0.75, 1.6]], [[2.9, 2.15], [3.3, 4.1], [2.5, 0.25]]])
        @ np.array([[[1.45, 3.5], [2.65, 1.75]], [[2.9, 1.4], [4.6, 0.45]]]))
    np.testing.assert_allclose(
        ndl.matmul(ndl.Tensor([[1.9, 1.9], [4.8, 4.9], [3.25, 3.75]]),
                   ndl.Tensor([[[1.25, 1.8], [1.7, 2.75]], [[2.15, 0.25], [1.5, 2.9]]])
                   ).numpy(),
        np.array([[1.9, 1.9], [4.8, 4.9], [3.25, 3.75]])
        @ np.array([[[1.25, 1.8], [1.7, 2.75]], [[2.15, 0.25], [1.5, 2.9]]]))


def test_summation_forward():
    data = [[2.2, 4.35, 1.4, 0.3, 2.65], [1.0, 0.85, 2.75, 3.8, 1.55],
            [3.2, 2.3, 3.45, 0.7, 0.0]]
    np.testing.assert_allclose(ndl.summation(ndl.Tensor(data)).numpy(), np.array(30.5))
    np.testing.assert_allclose(ndl.summation(ndl.Tensor(data), axes=1).numpy(),
                               np.array([10.9, 9.95, 9.65]))
    np.testing.assert_allclose(ndl.summation(ndl.Tensor([[1.5, 3.85, 3.45], [1.35, 1.3, 0.65],
                                                         [2.6, 4.55, 0.25]]), axes=0).numpy(),
                               np.array([5.45, 9.7, 4.35]))


def test_broadcast_to_forward():
    np.testing.assert_allclose(ndl.broadcast_to(ndl.Tensor([[1.85, 0.85, 0.6]]),
                                                shape=(3, 3, 3)).numpy(),
                               np.broadcast_to(np.array([[1.85, 0.85, 0.6]]), (3, 3, 3)))


def test_reshape_forward():
    x = [[2.9, 2.0, 2.4], [3.95, 3.95, 4.65], [2.1, 2.5, 2.7], [1.9, 4.85, 3.25],
         [3.35, 3.45, 3.45]]
    np.testing.assert_allclose(ndl.reshape(ndl.Tensor(x), shape=(15,)).numpy(),
                               np.array(x).reshape(15))
    np.testing.assert_allclose(ndl.reshape(ndl.Tensor(x), shape=(3, 5)).numpy(),
                               np.array(x).reshape(3, 5))


def test_negate_forward():
    np.testing.assert_allclose(ndl.negate(ndl.Tensor([[1.45, 0.55]])).numpy(),
                               np.array([[-1.45, -0.55]]))


def test_transpose_forward():
    np.testing.assert_allclose(ndl.transpose(ndl.Tensor([[[1.95]], [[2.7]], [[3.75]]]),
                                             axes=(1, 2)).numpy(),
                               np.array([[[1.95]], [[2.7]], [[3.75]]]))
    x = [[[[0.95]]], [[[2.55]]], [[[0.45]]]]
    np.testing.assert_allclose(ndl.transpose(ndl.Tensor(x), axes=(0, 1)).numpy(),
                               np.array(x).swapaxes(0, 1))
    y = [[[1.4, 3.1, 0.05], [2.25, 4.7, 3.8]], [[2.2, 4.55, 1.75], [0.05, 3.6, 0.35]]]
    np.testing.assert_allclose(ndl.transpose(ndl.Tensor(y)).numpy(), np.array(y).swapaxes(-1, -2))


def test_log_forward():
    np.testing.assert_allclose(ndl.log(ndl.Tensor([[4.], [4.55]])).numpy(),
                               np.array([[1.38629436112], [1.515127232963]]))


def test_exp_forward():
    np.testing.assert_allclose(ndl.exp(ndl.Tensor([[4.], [4.55]])).numpy(),
                               np.array([[54.598150033144], [94.632408314924]]))


def test_relu_forward():
    np.testing.assert_allclose(
        ndl.relu(ndl.Tensor([[-46.9, -48.8, -45.45, -49.], [-49.75, -48.75, -45.8, -49.25],
                             [-45.65, -45.25, -49.3, -47.65]])).numpy(),
        np.zeros((3, 4)))


# ------------------------------------------------------------------ backward
def test_power_scalar_backward():
    gradient_check(ndl.power_scalar, ndl.Tensor(np.random.randn(5, 4)),
                   scalar=np.random.randint(1))
    gradient_check(ndl.power_scalar, ndl.Tensor(np.random.randn(5, 4)), scalar=3)


def test_divide_backward():
    gradient_check(ndl.divide, ndl.Tensor(np.random.randn(5, 4)),
                   ndl.Tensor(5 + np.random.randn(5, 4)))


def test_divide_scalar_backward():
    gradient_check(ndl.divide_scalar, ndl.Tensor(np.random.randn(5, 4)),
                   scalar=np.random.randn(1))


def test_matmul_simple_backward():
    gradient_check(ndl.matmul, ndl.Tensor(np.random.randn(5, 4)),
                   ndl.Tensor(np.random.randn(4, 5)))


def test_matmul_batched_backward():
    gradient_check(ndl.matmul, ndl.Tensor(np.random.randn(6, 6, 5, 4)),
                   ndl.Tensor(np.random.randn(6, 6, 4, 3)))
    gradient_check(ndl.matmul, ndl.Tensor(np.random.randn(6, 6, 5, 4)),
                   ndl.Tensor(np.random.randn(4, 3)))
    gradient_check(ndl.matmul, ndl.Tensor(np.random.randn(5, 4)),
                   ndl.Tensor(np.random.randn(6, 6, 4, 3)))


def test_reshape_backward():
    gradient_check(ndl.reshape, ndl.Tensor(np.random.randn(5, 4)), shape=(4, 5))


def test_negate_backward():
    gradient_check(ndl.negate, ndl.Tensor(np.random.randn(5, 4)))


def test_transpose_backward():
    gradient_check(ndl.transpose, ndl.Tensor(np.random.randn(3, 5, 4)), axes=(1, 2))
    gradient_check(ndl.transpose, ndl.Tensor(np.random.randn(3, 5, 4)), axes=(0, 1))


def test_broadcast_to_backward():
    gradient_check(ndl.broadcast_to, ndl.Tensor(np.random.randn(3, 1)), shape=(3, 3))
    gradient_check(ndl.broadcast_to, ndl.Tensor(np.random.randn(1, 3)), shape=(3, 3))
    gradient_check(ndl.broadcast_to, ndl.Tensor(np.random.randn(1,)), shape=(3, 3, 3))
    gradient_check(ndl.broadcast_to, ndl.Tensor(np.random.randn()), shape=(3, 3, 3))
    gradient_check(ndl.broadcast_to, ndl.Tensor(np.random.randn(5, 4, 1)), shape=(5, 4, 3))


def test_summation_backward():
    gradient_check(ndl.summation, ndl.Tensor(np.random.randn(5, 4)), axes=(1,))
    gradient_check(ndl.summation, ndl.Tensor(np.random.randn(5, 4)), axes=(0,))
    gradient_check(ndl.summation, ndl.Tensor(np.random.randn(5, 4)), axes=(0, 1))
    gradient_check(ndl.summation, ndl.Tensor(np.random.randn(5, 4, 1)), axes=(0, 1))


def test_log_backward():
    gradient_check(ndl.log, ndl.Tensor(1 + np.random.rand(5, 4)))


def test_exp_backward():
    gradient_check(ndl.exp, ndl.Tensor(np.random.randn(5, 4)))


def test_relu_backward():
    gradient_check(ndl.relu, ndl.Tensor(np.random.randn(5, 4)))


# ------------------------------------------------------------------ topo sort
def test_topo_sort():
    # Test case 1
    a1, b1 = ndl.Tensor(np.asarray([[0.88282157]])), ndl.Tensor(np.asarray([[0.90170084]]))
    c1 = 3 * a1 * a1 + 4 * b1 * a1 - a1
    soln = np.array([np.array([[0.88282157]]), np.array([[2.64846471]]),
                     np.array([[2.33812177]]), np.array([[0.90170084]]),
                     np.array([[3.60680336]]), np.array([[3.1841638]]),
                     np.array([[5.52228558]]), np.array([[-0.88282157]]),
                     np.array([[4.63946401]])])
    topo_order = np.array([x.numpy() for x in ndl.autograd.find_topo_sort([c1])])
    assert len(soln) == len(topo_order)
    np.testing.assert_allclose(topo_order, soln, rtol=1e-06, atol=1e-06)

    # Test case 2
    a1 = ndl.Tensor(np.asarray([[0.20914675], [0.65264178]]))
    b1 = ndl.Tensor(np.asarray([[0.65394286, 0.08218317]]))
    c1 = 3 * ((b1 @ a1) + (2.3412 * b1) @ a1) + 1.5
    soln = [np.array([[0.65394286, 0.08218317]]), np.array([[0.20914675], [0.65264178]]),
            np.array([[0.19040619]]), np.array([[1.53101102, 0.19240724]]),
            np.array([[0.44577898]]), np.array([[0.63618518]]),
            np.array([[1.90855553]]), np.array([[3.40855553]])]
    topo_order = [x.numpy() for x in ndl.autograd.find_topo_sort([c1])]
    assert len(soln) == len(topo_order)
    for t1, t2 in zip(topo_order, soln):
        np.testing.assert_allclose(t1, t2, rtol=1e-06, atol=1e-06)


# ------------------------------------------------------------------ compute_gradient
def test_compute_gradient():
    gradient_check(lambda A, B, C: ndl.summation((A @ B + C) * (A @ B), axes=None),
                   ndl.Tensor(np.random.randn(10, 9)), ndl.Tensor(np.random.randn(9, 8)),
                   ndl.Tensor(np.random.randn(10, 8)), backward=True)
    gradient_check(lambda A, B: ndl.summation(ndl.broadcast_to(A, shape=(10, 9)) * B,
                                              axes=None),
                   ndl.Tensor(np.random.randn(10, 1)), ndl.Tensor(np.random.randn(10, 9)),
                   backward=True)
    gradient_check(lambda A, B, C: ndl.summation(ndl.reshape(A, shape=(10, 10)) @ B / 5 + C,
                                                 axes=None),
                   ndl.Tensor(np.random.randn(100)), ndl.Tensor(np.random.randn(10, 5)),
                   ndl.Tensor(np.random.randn(10, 5)), backward=True)

    # check gradient of gradient
    x2 = ndl.Tensor([6])
    x3 = ndl.Tensor([0])
    y = x2 * x2 + x2 * x3
    y.backward()
    grad_x2 = x2.grad
    grad_x3 = x3.grad
    # gradient of gradient
    grad_x2.backward()
    grad_x2_x2 = x2.grad
    grad_x2_x3 = x3.grad
    x2_val = x2.numpy()
    x3_val = x3.numpy()
    assert y.numpy() == x2_val * x2_val + x2_val * x3_val
    assert grad_x2.numpy() == 2 * x2_val + x3_val
    assert grad_x3.numpy() == x2_val
    assert grad_x2_x2.numpy() == 2
    assert grad_x2_x3.numpy() == 1


# ------------------------------------------------------------------ softmax loss, nn epoch
@needs_mnist
def test_softmax_loss_ndl():
    # test forward pass for log
    np.testing.assert_allclose(ndl.log(ndl.Tensor([[4.], [4.55]])).numpy(),
                               np.array([[1.38629436112], [1.515127232963]]))
    # test backward pass for log
    gradient_check(ndl.log, ndl.Tensor(1 + np.random.rand(5, 4)))

    X, y = parse_mnist(T10K_IMAGES, T10K_LABELS)
    np.random.seed(0)
    Z = ndl.Tensor(np.zeros((y.shape[0], 10)).astype(np.float32))
    y_one_hot = np.zeros((y.shape[0], 10))
    y_one_hot[np.arange(y.size), y] = 1
    y = ndl.Tensor(y_one_hot)
    np.testing.assert_allclose(softmax_loss(Z, y).numpy(), 2.3025850, rtol=1e-6, atol=1e-6)
    Zn = np.random.randn(y.shape[0], 10).astype(np.float32)
    np.random.randn(60000 - y.shape[0], 10)  # the RNG where the course's 60000-row draw leaves it
    Z = ndl.Tensor(Zn)
    # the course's 2.7291998 is for the train labels: on the test split, the textbook formula
    ref = np.mean(np.log(np.exp(Zn.astype(np.float64)).sum(1)) - (Zn * y_one_hot).sum(1))
    np.testing.assert_allclose(softmax_loss(Z, y).numpy(), ref, rtol=1e-6, atol=1e-6)

    # test softmax loss backward
    Zsmall = ndl.Tensor(np.random.randn(16, 10).astype(np.float32))
    ysmall = ndl.Tensor(y_one_hot[:16])
    gradient_check(softmax_loss, Zsmall, ysmall, tol=0.01, backward=True)


def test_nn_epoch_ndl():
    # test forward/backward pass for relu
    gradient_check(ndl.relu, ndl.Tensor(np.random.randn(5, 4)))

    # test nn gradients
    np.random.seed(0)
    X = np.random.randn(50, 5).astype(np.float32)
    y = np.random.randint(3, size=(50,)).astype(np.uint8)
    W1 = np.random.randn(5, 10).astype(np.float32) / np.sqrt(10)
    W2 = np.random.randn(10, 3).astype(np.float32) / np.sqrt(3)
    W1_0, W2_0 = W1.copy(), W2.copy()
    W1 = ndl.Tensor(W1)
    W2 = ndl.Tensor(W2)
    X_ = ndl.Tensor(X)
    y_one_hot = np.zeros((y.shape[0], 3))
    y_one_hot[np.arange(y.size), y] = 1
    y_ = ndl.Tensor(y_one_hot)
    dW1 = nd.Gradient(lambda W1_: softmax_loss(
        ndl.relu(X_ @ ndl.Tensor(W1_).reshape((5, 10))) @ W2, y_).numpy())(W1.numpy())
    dW2 = nd.Gradient(lambda W2_: softmax_loss(
        ndl.relu(X_ @ W1) @ ndl.Tensor(W2_).reshape((10, 3)), y_).numpy())(W2.numpy())
    W1, W2 = nn_epoch(X, y, W1, W2, lr=1.0, batch=50)
    np.testing.assert_allclose(dW1.reshape(5, 10), W1_0 - W1.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dW2.reshape(10, 3), W2_0 - W2.numpy(), rtol=1e-4, atol=1e-4)
    # the update keeps the weights' dtype (float64 here: NumPy 2 makes float32 / np.sqrt(10)
    # a float64 array)
    assert W1.dtype == W1_0.dtype.name and W2.dtype == W2_0.dtype.name

    # loss_err, as the course's full-epoch check calls it
    np.random.seed(0)
    h = np.random.randn(100, 10).astype(np.float32)
    labels = np.random.randint(10, size=(100,)).astype(np.uint8)
    loss, err = loss_err(ndl.Tensor(h), labels)
    ref = np.mean(np.log(np.exp(h.astype(np.float64)).sum(1)) - h[np.arange(100), labels])
    np.testing.assert_allclose(loss, ref, rtol=1e-5)
    assert err == np.mean(h.argmax(1) != labels)
