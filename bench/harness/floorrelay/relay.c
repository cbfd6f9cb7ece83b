/*
 * floor-relay: the least an epoll-driven TCP proxy can do, as a reference
 * for the bench's cost workloads (issue 12). It is not a product: no
 * connect timeout, no retry, no accounting, no limits, no UDP.
 *
 * It makes the same syscalls per unit of work as sluice's event loop does,
 * and nothing else: one SO_REUSEPORT listener and one epoll per thread,
 * edge-triggered sockets registered once, TCP_NODELAY inherited from the
 * listener, a short read or write ends that direction's turn, no read after
 * a connect completes, SO_ERROR only on an error edge, no shutdown for the
 * second FIN. Buffers come from a per-thread free list (64 KiB, as
 * sluice's), so the steady state allocates nothing. What it spends per
 * request above the kernel's share is the floor of any poll-driven proxy;
 * what sluice spends above it is sluice's and Go's.
 *
 * Usage: floor-relay [-t THREADS] LISTEN=BACKEND[,BACKEND...] ...
 * (IPv4 addresses as a.b.c.d:port; backends taken round-robin).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define BUF 65536
#define MAXSVC 64
#define MAXBACK 64

struct svc {
	struct sockaddr_in at;
	struct sockaddr_in back[MAXBACK];
	int nback;
	unsigned rr; /* shared by the threads, as sluice's picker is */
};

struct side {
	int fd;
	int readable, writable, hup;
};

struct pipe_ {
	struct side *src, *dst;
	char *buf;
	int r, w;
	int eof, shut;
};

struct conn;

/* What an epoll event points at: a listener, or one side of a connection. */
struct ref {
	int kind; /* 0 listener, 1 client side, 2 backend side */
	struct conn *c;
	int svc, fd; /* a listener's */
};

struct conn {
	struct side cs, bs;
	struct pipe_ up, down;
	struct ref cref, bref;
	int connected;
	int dead;
	struct conn *nextdead;
};

struct loop {
	int ep;
	char **free;
	int nfree, capfree;
	struct conn *dead; /* ended in this batch: freed after it */
};

static struct svc svcs[MAXSVC];
static int nsvc;

static char *getbuf(struct loop *l)
{
	if (l->nfree > 0)
		return l->free[--l->nfree];
	char *b = malloc(BUF);
	if (!b)
		abort();
	return b;
}

static void putbuf(struct loop *l, char *b)
{
	if (l->nfree == l->capfree) {
		l->capfree = l->capfree ? 2 * l->capfree : 64;
		l->free = realloc(l->free, l->capfree * sizeof(char *));
		if (!l->free)
			abort();
	}
	l->free[l->nfree++] = b;
}

static void note(struct side *s, unsigned ev)
{
	if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
		s->readable = 1;
	if (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))
		s->hup = 1;
	if (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))
		s->writable = 1;
}

static void finish(struct loop *l, struct conn *c)
{
	close(c->cs.fd);
	close(c->bs.fd);
	if (c->up.buf)
		putbuf(l, c->up.buf);
	if (c->down.buf)
		putbuf(l, c->down.buf);
	c->up.buf = c->down.buf = NULL;
	c->dead = 1;
	c->nextdead = l->dead;
	l->dead = c;
}

/* step moves one direction as far as it goes: 1 if anything happened, 0 if
 * not, -1 if the connection must end. */
static int step(struct loop *l, struct pipe_ *p, struct pipe_ *other)
{
	int moved = 0;
	if (p->buf && p->r < p->w && p->dst->writable) {
		int want = p->w - p->r;
		ssize_t n = send(p->dst->fd, p->buf + p->r, want, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno != EAGAIN)
				return -1;
			p->dst->writable = 0;
		} else {
			p->r += n;
			moved = 1;
			if (n < want)
				p->dst->writable = 0;
		}
	}
	if (p->buf && p->r == p->w) {
		putbuf(l, p->buf);
		p->buf = NULL;
	}
	if (!p->buf && !p->eof && p->src->readable) {
		char *b = getbuf(l);
		ssize_t n = recv(p->src->fd, b, BUF, 0);
		if (n < 0) {
			putbuf(l, b);
			if (errno != EAGAIN)
				return -1;
			p->src->readable = 0;
		} else if (n == 0) {
			putbuf(l, b);
			p->eof = 1;
			moved = 1;
		} else {
			p->buf = b;
			p->r = 0;
			p->w = n;
			moved = 1;
			if (n < BUF && !p->src->hup)
				p->src->readable = 0;
		}
	}
	if (p->eof && !p->buf && !p->shut) {
		if (!other->shut && shutdown(p->dst->fd, SHUT_WR) < 0 && errno != ENOTCONN)
			return -1;
		p->shut = 1;
		moved = 1;
	}
	return moved;
}

static void progress(struct loop *l, struct conn *c)
{
	if (!c->connected)
		return;
	for (;;) {
		int a = step(l, &c->up, &c->down);
		int b = a < 0 ? -1 : step(l, &c->down, &c->up);
		if (a < 0 || b < 0 || (c->up.shut && c->down.shut)) {
			finish(l, c);
			return;
		}
		if (!a && !b)
			return;
	}
}

static int add(int ep, int fd, struct ref *r, unsigned events)
{
	struct epoll_event ev = {.events = events | EPOLLET, .data.ptr = r};
	return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
}

static void start(struct loop *l, int fd, int si)
{
	struct svc *s = &svcs[si];
	struct conn *c = calloc(1, sizeof *c);
	if (!c)
		abort();
	c->cs.fd = fd;
	c->bs.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	c->up.src = &c->cs;
	c->up.dst = &c->bs;
	c->down.src = &c->bs;
	c->down.dst = &c->cs;
	c->cref = (struct ref){.kind = 1, .c = c};
	c->bref = (struct ref){.kind = 2, .c = c};
	int one = 1;
	struct sockaddr_in *to = &s->back[__atomic_fetch_add(&s->rr, 1, __ATOMIC_RELAXED) % s->nback];
	if (c->bs.fd < 0 || setsockopt(c->bs.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0 ||
	    add(l->ep, fd, &c->cref, EPOLLIN | EPOLLOUT | EPOLLRDHUP) < 0 ||
	    add(l->ep, c->bs.fd, &c->bref, EPOLLIN | EPOLLOUT | EPOLLRDHUP) < 0 ||
	    (connect(c->bs.fd, (struct sockaddr *)to, sizeof *to) < 0 && errno != EINPROGRESS)) {
		if (c->bs.fd >= 0)
			close(c->bs.fd);
		close(fd);
		free(c);
	}
}

static void event(struct loop *l, struct ref *r, unsigned ev)
{
	if (r->kind == 0) {
		for (;;) {
			int fd = accept4(r->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
			if (fd < 0) {
				if (errno == EINTR || errno == ECONNABORTED)
					continue;
				return; /* EAGAIN; anything else ends this edge too */
			}
			start(l, fd, r->svc);
		}
	}
	struct conn *c = r->c;
	if (c->dead)
		return; /* ended by an earlier event of this batch */
	if (r->kind == 1) {
		note(&c->cs, ev);
	} else if (!c->connected) {
		if (ev & (EPOLLERR | EPOLLHUP)) {
			int err = 0;
			socklen_t len = sizeof err;
			if (getsockopt(c->bs.fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err || !(ev & EPOLLOUT)) {
				finish(l, c);
				return;
			}
		} else if (!(ev & EPOLLOUT)) {
			return;
		}
		c->connected = 1;
		note(&c->bs, ev);
	} else {
		note(&c->bs, ev);
	}
	progress(l, c);
}

static void *run(void *arg)
{
	struct loop *l = arg;
	struct epoll_event evs[256];
	for (;;) {
		int n = epoll_wait(l->ep, evs, 256, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			perror("epoll_wait");
			exit(1);
		}
		for (int i = 0; i < n; i++)
			event(l, evs[i].data.ptr, evs[i].events);
		/* A connection that ended is freed only after its batch: a later
		 * event of the same batch may point at it (closing a descriptor
		 * takes it out of the epoll set, not out of a batch returned). */
		while (l->dead) {
			struct conn *c = l->dead;
			l->dead = c->nextdead;
			free(c);
		}
	}
	return NULL;
}

static int parse(const char *s, struct sockaddr_in *a)
{
	char host[64];
	const char *colon = strrchr(s, ':');
	if (!colon || colon - s >= (long)sizeof host)
		return -1;
	memcpy(host, s, colon - s);
	host[colon - s] = 0;
	memset(a, 0, sizeof *a);
	a->sin_family = AF_INET;
	a->sin_port = htons(atoi(colon + 1));
	return inet_pton(AF_INET, host, &a->sin_addr) == 1 ? 0 : -1;
}

int main(int argc, char **argv)
{
	int threads = 2, i = 1;
	if (argc > 2 && !strcmp(argv[1], "-t")) {
		threads = atoi(argv[2]);
		i = 3;
	}
	for (; i < argc && nsvc < MAXSVC; i++) {
		char *arg = strdup(argv[i]), *eq = strchr(arg, '=');
		struct svc *s = &svcs[nsvc];
		if (!eq || parse((*eq = 0, arg), &s->at) < 0) {
			fprintf(stderr, "floor-relay: bad service %s (want LISTEN=BACKEND[,BACKEND...])\n", argv[i]);
			return 2;
		}
		for (char *b = strtok(eq + 1, ","); b && s->nback < MAXBACK; b = strtok(NULL, ",")) {
			if (parse(b, &s->back[s->nback++]) < 0) {
				fprintf(stderr, "floor-relay: bad backend %s\n", b);
				return 2;
			}
		}
		if (!s->nback) {
			fprintf(stderr, "floor-relay: %s has no backend\n", argv[i]);
			return 2;
		}
		nsvc++;
	}
	if (!nsvc || threads < 1) {
		fprintf(stderr, "usage: floor-relay [-t THREADS] LISTEN=BACKEND[,BACKEND...] ...\n");
		return 2;
	}
	pthread_t tid[threads];
	for (int t = 0; t < threads; t++) {
		struct loop *l = calloc(1, sizeof *l);
		l->ep = epoll_create1(EPOLL_CLOEXEC);
		for (int k = 0; k < nsvc; k++) {
			int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
			struct ref *r = calloc(1, sizeof *r);
			*r = (struct ref){.kind = 0, .svc = k, .fd = fd};
			if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
			    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0 ||
			    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0 ||
			    bind(fd, (struct sockaddr *)&svcs[k].at, sizeof svcs[k].at) < 0 || listen(fd, 4096) < 0 ||
			    add(l->ep, fd, r, EPOLLIN) < 0) {
				perror("floor-relay: listen");
				return 1;
			}
		}
		if (pthread_create(&tid[t], NULL, run, l)) {
			fprintf(stderr, "floor-relay: thread\n");
			return 1;
		}
	}
	printf("floor-relay: %d services, %d threads\n", nsvc, threads);
	fflush(stdout);
	for (int t = 0; t < threads; t++)
		pthread_join(tid[t], NULL);
	return 0;
}
