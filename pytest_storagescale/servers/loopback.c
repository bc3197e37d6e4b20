/* Loopback only: a preload library that turns a bind() to the wildcard address into a
 * bind() to loopback, for the embedded servers that have no setting of their own for
 * the address they listen on (xrootd and cmsd: `xrd.port N` binds *:N; see
 * pytest_storagescale/servers/loopback.py, which builds this file and names it in the
 * server's LD_PRELOAD).
 *
 *   AF_INET   0.0.0.0 -> 127.0.0.1
 *   AF_INET6  ::      -> ::ffff:127.0.0.1 on a dual-stack socket (IPV6_V6ONLY off: it
 *                        then takes IPv4 loopback connections, the address every client
 *                        of the embedded servers uses), ::1 on an IPv6-only socket
 *
 * The port and every other field are kept; a bind() to any other address (a given
 * interface, a Unix socket path) is passed on as it is.
 *
 * STORAGESCALE_BIND_ADDRESS (an IPv4 or IPv6 literal, for a server its tests' network
 * namespaces must reach: an address of an interface the tests made) replaces
 * loopback above: an IPv4 one for AF_INET and a dual-stack socket (mapped), an IPv6 one
 * for AF_INET6; a socket it does not fit keeps loopback. Anything else in it: loopback.
 *
 * A UDP socket that sends before any bind() (xrootd's summary reports, `xrd.report`)
 * would be bound by the kernel to the wildcard address and receive from every
 * interface: before its first connect(), sendto() or sendmsg() to a loopback address it
 * is bound to loopback (port 0: the kernel's choice). Nothing else is changed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_function)(int, const struct sockaddr *, socklen_t);

static bind_function next_bind(void)
{
    static bind_function found;
    if (!found)
        found = (bind_function)dlsym(RTLD_NEXT, "bind");
    return found;
}

/* STORAGESCALE_BIND_ADDRESS, read once: 4 or 6 when it holds such a literal, else 0 */
static int wanted_family = -1;
static struct in_addr wanted4;
static struct in6_addr wanted6;

static int wanted(void)
{
    if (wanted_family < 0) {
        const char *text = getenv("STORAGESCALE_BIND_ADDRESS");
        wanted_family = 0;
        if (text && inet_pton(AF_INET, text, &wanted4) == 1)
            wanted_family = 4;
        else if (text && inet_pton(AF_INET6, text, &wanted6) == 1)
            wanted_family = 6;
    }
    return wanted_family;
}

static void mapped(struct in6_addr *target, struct in_addr source)
{
    memset(target, 0, sizeof *target);
    target->s6_addr[10] = 0xff;
    target->s6_addr[11] = 0xff;
    memcpy(&target->s6_addr[12], &source, 4);
}

int bind(int fd, const struct sockaddr *address, socklen_t length)
{
    bind_function real = next_bind();
    if (!real) {
        errno = ENOSYS;
        return -1;
    }
    if (address && address->sa_family == AF_INET && length >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in ipv4;
        memcpy(&ipv4, address, sizeof ipv4);
        if (ipv4.sin_addr.s_addr == htonl(INADDR_ANY)) {
            if (wanted() == 4)
                ipv4.sin_addr = wanted4;
            else
                ipv4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            return real(fd, (const struct sockaddr *)&ipv4, sizeof ipv4);
        }
    } else if (address && address->sa_family == AF_INET6
               && length >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 ipv6;
        memcpy(&ipv6, address, sizeof ipv6);
        if (IN6_IS_ADDR_UNSPECIFIED(&ipv6.sin6_addr)) {
            int only_ipv6 = 0;
            socklen_t size = sizeof only_ipv6;
            if (getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &only_ipv6, &size) != 0)
                only_ipv6 = 1; /* unknown: the IPv6 loopback, never a wider one */
            if (wanted() == 6) {
                ipv6.sin6_addr = wanted6;
            } else if (only_ipv6) {
                ipv6.sin6_addr = in6addr_loopback;
            } else {
                struct in_addr four;
                four.s_addr = htonl(INADDR_LOOPBACK);
                mapped(&ipv6.sin6_addr, wanted() == 4 ? wanted4 : four);
            }
            return real(fd, (const struct sockaddr *)&ipv6, sizeof ipv6);
        }
    }
    return real(fd, address, length);
}

/* Whether ``address`` is a loopback one (127/8, ::1, ::ffff:127/104). */
static int to_loopback(const struct sockaddr *address, socklen_t length)
{
    if (!address)
        return 0;
    if (address->sa_family == AF_INET && length >= sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *ipv4 = (const struct sockaddr_in *)address;
        return (ntohl(ipv4->sin_addr.s_addr) >> 24) == 127;
    }
    if (address->sa_family == AF_INET6 && length >= sizeof(struct sockaddr_in6)) {
        const struct in6_addr *six = &((const struct sockaddr_in6 *)address)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(six) || (IN6_IS_ADDR_V4MAPPED(six) && six->s6_addr[12] == 127);
    }
    return 0;
}

/* A UDP socket not bound yet, about to send to loopback: bound to loopback first (a
 * wildcard bind() here, which bind() above turns into loopback). */
static void bind_before_sending(int fd, const struct sockaddr *target, socklen_t length)
{
    int type = 0;
    socklen_t size = sizeof type;
    struct sockaddr_storage own;
    socklen_t own_length = sizeof own;
    if (!to_loopback(target, length)
        || getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &size) != 0 || type != SOCK_DGRAM
        || getsockname(fd, (struct sockaddr *)&own, &own_length) != 0)
        return;
    if (own.ss_family == AF_INET) {
        struct sockaddr_in *ipv4 = (struct sockaddr_in *)&own;
        if (ipv4->sin_port != 0)
            return; /* bound already */
        ipv4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        next_bind()(fd, (const struct sockaddr *)ipv4, sizeof *ipv4);
    } else if (own.ss_family == AF_INET6) {
        struct sockaddr_in6 *ipv6 = (struct sockaddr_in6 *)&own;
        if (ipv6->sin6_port != 0)
            return;
        if (target->sa_family == AF_INET6
            && IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)target)->sin6_addr)) {
            ipv6->sin6_addr = in6addr_loopback;
        } else {
            struct in_addr four;
            four.s_addr = htonl(INADDR_LOOPBACK);
            mapped(&ipv6->sin6_addr, four);
        }
        next_bind()(fd, (const struct sockaddr *)ipv6, sizeof *ipv6);
    }
}

typedef int (*connect_function)(int, const struct sockaddr *, socklen_t);
typedef ssize_t (*sendto_function)(int, const void *, size_t, int, const struct sockaddr *,
                                   socklen_t);
typedef ssize_t (*sendmsg_function)(int, const struct msghdr *, int);

int connect(int fd, const struct sockaddr *address, socklen_t length)
{
    static connect_function real;
    if (!real)
        real = (connect_function)dlsym(RTLD_NEXT, "connect");
    if (!real || !next_bind()) {
        errno = ENOSYS;
        return -1;
    }
    bind_before_sending(fd, address, length);
    return real(fd, address, length);
}

ssize_t sendto(int fd, const void *data, size_t size, int flags,
               const struct sockaddr *address, socklen_t length)
{
    static sendto_function real;
    if (!real)
        real = (sendto_function)dlsym(RTLD_NEXT, "sendto");
    if (!real || !next_bind()) {
        errno = ENOSYS;
        return -1;
    }
    bind_before_sending(fd, address, length);
    return real(fd, data, size, flags, address, length);
}

ssize_t sendmsg(int fd, const struct msghdr *message, int flags)
{
    static sendmsg_function real;
    if (!real)
        real = (sendmsg_function)dlsym(RTLD_NEXT, "sendmsg");
    if (!real || !next_bind()) {
        errno = ENOSYS;
        return -1;
    }
    if (message)
        bind_before_sending(fd, (const struct sockaddr *)message->msg_name,
                            message->msg_namelen);
    return real(fd, message, flags);
}
