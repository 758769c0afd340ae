# tf_scripts.py -- the text of the small TF1 training script that tests run under `rtkit run`, in one place.


def session_training(width, batch, steps, dataset=False):
    """A tf.compat.v1 Session loop of `steps` training steps (loss and train op fetched together) on a
    [batch, width] float input: fed through a placeholder, or (dataset=True) read from a tf.data iterator
    inside the graph, which the scheduler can stage."""
    if dataset:
        source = (f"ds = tf.data.Dataset.from_tensor_slices(np.random.rand(2048, {width}).astype(np.float32))"
                  f".batch({batch}).repeat()\n"
                  "x = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()\n")
        feed = ""
    else:
        source = f"x = tf.compat.v1.placeholder(tf.float32, [None, {width}])\n"
        feed = f", {{x: np.random.rand({batch}, {width}).astype(np.float32)}}"
    return ("import os\n"
            'os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")\n'
            "import numpy as np, tensorflow as tf\n"
            "tf.compat.v1.disable_eager_execution()\n"
            + source +
            f"w = tf.Variable(tf.random.normal([{width}, {width}]))\n"
            "loss = tf.reduce_sum(tf.matmul(tf.matmul(x, w), w))\n"
            "train = tf.compat.v1.train.GradientDescentOptimizer(1e-6).minimize(loss)\n"
            "with tf.compat.v1.Session() as s:\n"
            "    s.run(tf.compat.v1.global_variables_initializer())\n"
            f"    for i in range({steps}):\n"
            f"        s.run([loss, train]{feed})\n")
