// Element types meshfuse tensors can hold, and their properties.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace meshfuse {

// Names follow nvFuser's Python DataType (Float, Double, Half, BFloat16, Int, Int32, Bool).
enum class DataType : uint8_t { Float, Double, Half, BFloat16, Int, Int32, Bool };

size_t dataTypeSize(DataType dtype);
std::string toString(DataType dtype);
bool isFloatingPoint(DataType dtype);
bool isIntegral(DataType dtype);  // Int, Int32 (not Bool)
// The type of `a op b` under numpy-like promotion (floats win, wider wins).
DataType promoteTypes(DataType a, DataType b);

}  // namespace meshfuse
