"""The exceptions qkv raises. qkv re-exports them (qkv.InvalidArgument, ...); qkv.mpi re-exports
MPIError and Timeout. Each carries the C++ library's message unchanged."""


class Error(Exception):
    """The base of every error qkv raises."""


class InvalidArgument(Error, ValueError):
    """Bad input: shapes that do not fit together, an option out of range, a bad mask, an array
    qkv cannot read. Nothing was computed; every object is as before."""


class LimitExceeded(Error, ValueError):
    """The request is larger than a device limit. Refused before any work; the context stays usable."""


class NumericOverflow(Error, ArithmeticError):
    """Finite inputs too large for the precision computed in (a score, a value sum or a result
    would not be finite). No result is returned; the context stays usable."""


class Unavailable(Error, RuntimeError):
    """No Vulkan loader, no device, or a feature the device or the entry point lacks."""


class NoMatchingDevice(Unavailable):
    """The device asked for (an index or a name, or QKV_DEVICE) names no usable device."""


class DeviceLost(Error, RuntimeError):
    """The device was lost (VK_ERROR_DEVICE_LOST): make a new Context."""


class OutOfMemory(Error, MemoryError):
    """A host or device allocation failed; what the call allocated is released."""


class VulkanError(Error, RuntimeError):
    """Another failure of the Vulkan runtime."""


class MPIError(Error, RuntimeError):
    """An MPI call failed, or a rank failed with an error qkv does not know (qkv.mpi)."""


class Timeout(MPIError, TimeoutError):
    """A wait on other ranks outlasted the timeout (qkv.mpi); the message names the ranks."""
