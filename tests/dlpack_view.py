"""A float32 vector at any device address, offered to jax through DLPack, made by hand.

The way a buffer from another library (or a view into one) reaches jax,
without needing such a library. jax keeps the DLManagedTensor's address and
reads it again when the array dies, so the view must outlive every array
made from it.
"""

import ctypes

# jax calls the deleter unconditionally when the array dies (a null one ends
# the process with std::bad_function_call): the memory is the owner's, so it does nothing.
_DELETER_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_KEEP_NOTHING = _DELETER_TYPE(lambda _: None)


class _DLDevice(ctypes.Structure):
  _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
  _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
  _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
              ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
              ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
  _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DevicePointerView:
  """`owner` keeps the memory alive; keep the view alive while jax arrays use it."""

  def __init__(self, address: int, n: int, owner):
    self.owner = owner
    self.shape = (ctypes.c_int64 * 1)(n)
    self.managed = _DLManagedTensor(_DLTensor(address, _DLDevice(2, 0), 1, _DLDataType(2, 32, 1),  # kDLCUDA, f32
                                              self.shape, None, 0), None,
                                    ctypes.cast(_KEEP_NOTHING, ctypes.c_void_p))

  def __dlpack_device__(self):
    return (2, 0)

  def __dlpack__(self, **_):
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(ctypes.addressof(self.managed), b"dltensor", None)
