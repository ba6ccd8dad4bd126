"""Closes an X11 top-level window the way a window manager's close button
does: a WM_DELETE_WINDOW client message (no window manager runs under Xvfb).

usage: python3 close_window.py [--count] TITLE
prints how many windows have that title (and, without --count, were asked to close)
"""
import ctypes
import ctypes.util
import sys

x11 = ctypes.cdll.LoadLibrary(ctypes.util.find_library("X11") or "libX11.so.6")
Window = ctypes.c_ulong
Atom = ctypes.c_ulong

x11.XOpenDisplay.restype = ctypes.c_void_p
x11.XOpenDisplay.argtypes = [ctypes.c_char_p]
x11.XDefaultRootWindow.restype = Window
x11.XDefaultRootWindow.argtypes = [ctypes.c_void_p]
x11.XInternAtom.restype = Atom
x11.XInternAtom.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
x11.XQueryTree.argtypes = [
    ctypes.c_void_p,
    Window,
    ctypes.POINTER(Window),
    ctypes.POINTER(Window),
    ctypes.POINTER(ctypes.POINTER(Window)),
    ctypes.POINTER(ctypes.c_uint),
]
x11.XFetchName.argtypes = [ctypes.c_void_p, Window, ctypes.POINTER(ctypes.c_char_p)]
x11.XFree.argtypes = [ctypes.c_void_p]
x11.XSendEvent.argtypes = [ctypes.c_void_p, Window, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
x11.XFlush.argtypes = [ctypes.c_void_p]
x11.XCloseDisplay.argtypes = [ctypes.c_void_p]


class ClientMessage(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("serial", ctypes.c_ulong),
        ("send_event", ctypes.c_int),
        ("display", ctypes.c_void_p),
        ("window", Window),
        ("message_type", Atom),
        ("format", ctypes.c_int),
        ("data", ctypes.c_long * 5),
    ]


class XEvent(ctypes.Union):
    # XEvent is a union padded to 24 longs.
    _fields_ = [("xclient", ClientMessage), ("pad", ctypes.c_long * 24)]


CLIENT_MESSAGE = 33


def main() -> int:
    args = sys.argv[1:]
    only_count = args[:1] == ["--count"]
    title = args[-1].encode()
    dpy = x11.XOpenDisplay(None)
    if not dpy:
        print("cannot open display", file=sys.stderr)
        return 2
    root = x11.XDefaultRootWindow(dpy)
    protocols = x11.XInternAtom(dpy, b"WM_PROTOCOLS", 0)
    delete = x11.XInternAtom(dpy, b"WM_DELETE_WINDOW", 0)
    root_ret, parent = Window(), Window()
    children = ctypes.POINTER(Window)()
    count = ctypes.c_uint()
    x11.XQueryTree(dpy, root, ctypes.byref(root_ret), ctypes.byref(parent),
                   ctypes.byref(children), ctypes.byref(count))
    asked = 0
    for i in range(count.value):
        win = children[i]
        name = ctypes.c_char_p()
        if x11.XFetchName(dpy, win, ctypes.byref(name)) and name.value == title:
            asked += 1
            if only_count:
                x11.XFree(name)
                continue
            ev = XEvent()
            ev.xclient.type = CLIENT_MESSAGE
            ev.xclient.window = win
            ev.xclient.message_type = protocols
            ev.xclient.format = 32
            ev.xclient.data[0] = delete
            ev.xclient.data[1] = 0  # CurrentTime
            x11.XSendEvent(dpy, win, 0, 0, ctypes.byref(ev))
        if name:
            x11.XFree(name)
    if children:
        x11.XFree(children)
    x11.XFlush(dpy)
    x11.XCloseDisplay(dpy)
    print(asked)
    return 0 if asked or only_count else 1


if __name__ == "__main__":
    sys.exit(main())
