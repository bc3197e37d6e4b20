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
 * interface, a Unix socket path) is passed on as it is. Nothing else is changed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
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
            if (only_ipv6) {
                ipv6.sin6_addr = in6addr_loopback;
            } else {
                memset(&ipv6.sin6_addr, 0, sizeof ipv6.sin6_addr);
                ipv6.sin6_addr.s6_addr[10] = 0xff;
                ipv6.sin6_addr.s6_addr[11] = 0xff;
                ipv6.sin6_addr.s6_addr[12] = 127;
                ipv6.sin6_addr.s6_addr[15] = 1;
            }
            return real(fd, (const struct sockaddr *)&ipv6, sizeof ipv6);
        }
    }
    return real(fd, address, length);
}
