/* A stand-in for the CUDA driver that prints each call the generated launchers make, so a test can read
   exactly what a launch would have passed. Set stub_param_sizes / stub_param_count before a launch: the
   driver learns parameter sizes from the kernel image, the stub from the test. */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

size_t stub_param_sizes[64];
int stub_param_count;
static int maps_encoded;

static uint64_t read_u64(const unsigned char *at) { uint64_t v; memcpy(&v, at, 8); return v; }
static uint32_t read_u32(const unsigned char *at) { uint32_t v; memcpy(&v, at, 4); return v; }
static uint16_t read_u16(const unsigned char *at) { uint16_t v; memcpy(&v, at, 2); return v; }

/* The image's length: for an ELF64 file the end of its last header table or section (NOBITS sections take
   no bytes); PTX is NUL-terminated text. */
static size_t image_length(const unsigned char *bytes)
{
    if (memcmp(bytes, "\177ELF", 4) != 0)
        return strlen((const char *)bytes);
    uint64_t section_headers = read_u64(bytes + 0x28), program_headers = read_u64(bytes + 0x20);
    uint16_t section_entry = read_u16(bytes + 0x3A), sections = read_u16(bytes + 0x3C);
    uint64_t end = section_headers + (uint64_t)section_entry * sections;
    uint64_t programs_end = program_headers + (uint64_t)read_u16(bytes + 0x36) * read_u16(bytes + 0x38);
    end = programs_end > end ? programs_end : end;
    for (uint16_t i = 0; i < sections; ++i) {
        const unsigned char *header = bytes + section_headers + (uint64_t)i * section_entry;
        uint64_t section_end = read_u64(header + 0x18) + read_u64(header + 0x20);
        if (read_u32(header + 4) != 8 && section_end > end)   /* 8: SHT_NOBITS */
            end = section_end;
    }
    return (size_t)end;
}

/* Prints which image is loaded as FNV-1a over its bytes, so a test can tell variants apart. */
CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    const unsigned char *bytes = image;
    uint64_t hash = 1469598103934665603ull;
    for (size_t i = 0, n = image_length(bytes); i < n; ++i)
        hash = (hash ^ bytes[i]) * 1099511628211ull;
    printf("load %016llx\n", (unsigned long long)hash);
    *module = (CUmodule)(uintptr_t)0x1000;
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name)
{
    (void)module;
    printf("function %s\n", name);
    *function = (CUfunction)(uintptr_t)(0x2000 + strlen(name));
    return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule module)
{
    (void)module;
    printf("unload\n");
    return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction function, CUfunction_attribute attribute, int value)
{
    (void)function;
    printf("attribute %d %d\n", (int)attribute, value);
    return CUDA_SUCCESS;
}

CUresult cuTensorMapEncodeTiled(CUtensorMap *map, CUtensorMapDataType type, cuuint32_t rank, void *address,
                                const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box,
                                const cuuint32_t *element_strides, CUtensorMapInterleave interleave,
                                CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob)
{
    printf("map type %d rank %u address %llu dims", (int)type, rank, (unsigned long long)(uintptr_t)address);
    for (cuuint32_t i = 0; i < rank; ++i) printf(" %llu", (unsigned long long)dims[i]);
    printf(" strides");
    for (cuuint32_t i = 0; i + 1 < rank; ++i) printf(" %llu", (unsigned long long)strides[i]);
    printf(" box");
    for (cuuint32_t i = 0; i < rank; ++i) printf(" %u", box[i]);
    printf(" element_strides");
    for (cuuint32_t i = 0; i < rank; ++i) printf(" %u", element_strides[i]);
    printf(" interleave %d swizzle %d l2 %d oob %d\n", (int)interleave, (int)swizzle, (int)l2, (int)oob);
    memset(map, 0xA0 + maps_encoded++, sizeof *map);
    return CUDA_SUCCESS;
}

/* One line per kernel parameter: its bytes in hex, as the launcher packed them. */
static void print_params(void **params)
{
    for (int i = 0; i < stub_param_count; ++i) {
        const unsigned char *bytes = params[i];
        printf("param %d ", i);
        for (size_t b = 0; b < stub_param_sizes[i]; ++b) printf("%02x", bytes[b]);
        printf("\n");
    }
}

CUresult cuLaunchKernel(CUfunction function, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params,
                        void **extra)
{
    (void)function;
    printf("launch grid %u %u %u block %u %u %u shared %u stream %llu extra %d\n", gx, gy, gz, bx, by, bz, shared,
           (unsigned long long)(uintptr_t)stream, extra != NULL);
    print_params(params);
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction function, void **params, void **extra)
{
    (void)function;
    printf("launch_ex grid %u %u %u block %u %u %u shared %u stream %llu extra %d", config->gridDimX,
           config->gridDimY, config->gridDimZ, config->blockDimX, config->blockDimY, config->blockDimZ,
           config->sharedMemBytes, (unsigned long long)(uintptr_t)config->hStream, extra != NULL);
    for (unsigned int i = 0; i < config->numAttrs; ++i)
        if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
            printf(" cluster %u %u %u", config->attrs[i].value.clusterDim.x, config->attrs[i].value.clusterDim.y,
                   config->attrs[i].value.clusterDim.z);
    printf("\n");
    print_params(params);
    return CUDA_SUCCESS;
}
