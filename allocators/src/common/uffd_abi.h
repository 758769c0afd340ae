/* uffd_abi.h -- the userfaultfd and PAGEMAP_SCAN interface (linux/userfaultfd.h, linux/fs.h), spelled out: older
 * headers lack the parts rtkit uses, and the kernel is asked at run time anyway. */
#ifndef RTK_COMMON_UFFD_ABI_H
#define RTK_COMMON_UFFD_ABI_H

#include <stdint.h>
#include <sys/ioctl.h>

#define UFFD_USER_MODE_ONLY_ 1
#define UFFD_API_ 0xAAull
#define UFFD_FEATURE_EVENT_REMAP_ (1ull << 2)
#define UFFD_FEATURE_SIGBUS_ (1ull << 7)
#define UFFD_FEATURE_WP_ASYNC_ (1ull << 15)
#define UFFD_FEATURE_MOVE_ (1ull << 16)
#define UFFDIO_REGISTER_MODE_MISSING_ (1ull << 0)
#define UFFDIO_REGISTER_MODE_WP_ (1ull << 1)
#define UFFD_EVENT_PAGEFAULT_ 0x12
#define UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES_ (1ull << 1)
struct uffdio_api_ { uint64_t api, features, ioctls; };
struct uffdio_register_ { uint64_t start, len, mode, ioctls; };
struct uffdio_range_ { uint64_t start, len; };
struct uffdio_copy_ { uint64_t dst, src, len, mode; int64_t copy; };
struct uffdio_zeropage_ { struct uffdio_range_ range; uint64_t mode; int64_t zeropage; };
struct uffdio_move_ { uint64_t dst, src, len, mode; int64_t move; };
/* struct uffd_msg: 32 bytes; a page fault's address at offset 16 */
struct uffd_msg_ { uint8_t event, reserved1; uint16_t reserved2; uint32_t reserved3; uint64_t flags, address, arg3; };
#define UFFDIO_API_ _IOWR(0xAA, 0x3F, struct uffdio_api_)
#define UFFDIO_REGISTER_ _IOWR(0xAA, 0x00, struct uffdio_register_)
#define UFFDIO_UNREGISTER_ _IOR(0xAA, 0x01, struct uffdio_range_)
#define UFFDIO_WAKE_ _IOR(0xAA, 0x02, struct uffdio_range_)
#define UFFDIO_COPY_MODE_DONTWAKE_ (1ull << 0)
#define UFFDIO_COPY_ _IOWR(0xAA, 0x03, struct uffdio_copy_)
#define UFFDIO_ZEROPAGE_ _IOWR(0xAA, 0x04, struct uffdio_zeropage_)
#define UFFDIO_MOVE_ _IOWR(0xAA, 0x05, struct uffdio_move_)
struct pm_scan_arg_ {
    uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages, category_inverted, category_mask,
        category_anyof_mask, return_mask;
};
#define PAGEMAP_SCAN_ _IOWR('f', 16, struct pm_scan_arg_)
#define PAGE_IS_WRITTEN_ (1ull << 1)
#define PAGE_IS_FILE_ (1ull << 2)
#define PAGE_IS_PRESENT_ (1ull << 3)
#define PAGE_IS_PFNZERO_ (1ull << 5)
#define PM_SCAN_WP_MATCHING_ (1ull << 0)
#define PM_SCAN_CHECK_WPASYNC_ (1ull << 1)

#endif
