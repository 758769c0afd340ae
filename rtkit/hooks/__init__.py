# rtkit.hooks -- TensorFlow instrumentation installed inside the child: step detection, timing, extension points.
