"""The GPU path: the kernels alone (``bench_gpu.py``), the Loader on a device
(``bench_gpu_loader.py``), its host side with every device call counted and not made
(``gpu_host.py`` on ``null_device.py``), device calls per batch counted (``accounting.py``),
threads and CPU per thread (``gpu_threads.py``), Nsight Compute on the kernels
(``kernel_profile.py``), two ranks on one device (``gpu_ranks.py``), and a lent device's checks
in one call (``gpu_check.py``, run by ``../gpu_session.sh``)."""
